use strict;
use warnings;
use lib '.';
use Str;

my %tests = (
    positives => sub { maximum(3, 9, 4) == 9 or die "got " . maximum(3, 9, 4) . "\n" },
    mixed     => sub { maximum(-3, 2, -1) == 2 or die "got " . maximum(-3, 2, -1) . "\n" },
    negatives => sub { maximum(-7, -2, -5) == -2 or die "got " . maximum(-7, -2, -5) . "\n" },
);

my @names = @ARGV ? @ARGV : sort keys %tests;
my $failed = 0;
for my $n (@names) {
  die "no test $n\n" unless exists $tests{$n};
  if (eval { $tests{$n}->(); 1 }) { print "ok $n\n" } else { $failed++; print "FAIL $n: $@" }
}
exit($failed ? 1 : 0);
