package Str;
use strict;
use warnings;
use Exporter 'import';
our @EXPORT = qw(maximum);

# maximum is the largest of a non-empty list of numbers.
sub maximum {
    my $max = 0;
    for my $x (@_) {
        $max = $x if $x > $max;
    }
    return $max;
}

1;
