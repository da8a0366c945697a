use strict;
use warnings;
use lib '.';
use Str;

my %tests = (
    leading  => sub { trim('  a b') eq 'a b' or die "got '" . trim('  a b') . "'\n" },
    trailing => sub { trim('a b  ') eq 'a b' or die "got '" . trim('a b  ') . "'\n" },
    both     => sub { trim(" \tx \n") eq 'x' or die "got '" . trim(" \tx \n") . "'\n" },
);

my @names = @ARGV ? @ARGV : sort keys %tests;
my $failed = 0;
for my $n (@names) {
  die "no test $n\n" unless exists $tests{$n};
  if (eval { $tests{$n}->(); 1 }) { print "ok $n\n" } else { $failed++; print "FAIL $n: $@" }
}
exit($failed ? 1 : 0);
