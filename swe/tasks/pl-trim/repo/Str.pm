package Str;
use strict;
use warnings;
use Exporter 'import';
our @EXPORT = qw(trim);

# trim removes the whitespace around a string.
sub trim {
    my ($s) = @_;
    $s =~ s/^\s+//;
    return $s;
}

1;
