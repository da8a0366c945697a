#!/usr/bin/env bash
# After the whole test suite: nothing a sandbox used may be left behind —
# no overlay or tmpfs mounts of Orchard's, no cgroups, no agent processes,
# no test state directories.
set -u
fail=0
mounts=$(grep -E 'orchard' /proc/self/mountinfo || true)
if [ -n "$mounts" ]; then echo "leak: mounts left:"; echo "$mounts"; fail=1; fi
for h in /sys/fs/cgroup/*/; do
  d="$h/orchard"
  if [ -d "$d" ]; then
    left=$(find "$d" -mindepth 1 -type d 2>/dev/null)
    if [ -n "$left" ]; then echo "leak: cgroups left:"; echo "$left"; fail=1; fi
  fi
done
# Zombies are skipped: they hold nothing but a pid, and reaping orphans is
# the host init's job (a replica a test killed leaves its agents to it).
procs=$(ps -eo pid=,stat=,args= | awk '$2 !~ /^Z/ && /orchard-agent/ && !/awk/' || true)
if [ -n "$procs" ]; then echo "leak: agent processes left:"; echo "$procs"; fail=1; fi
# With ORCHARD_LEAK_MARK (set by scripts/dev.sh test), only dirs made
# after the run began count: another run's are not this one's leak.
if [ -n "${ORCHARD_LEAK_MARK:-}" ] && [ -e "$ORCHARD_LEAK_MARK" ]; then
  dirs=$(find /tmp -maxdepth 1 -name 'orchard-test-*' -newer "$ORCHARD_LEAK_MARK" 2>/dev/null || true)
else
  dirs=$(ls -d /tmp/orchard-test-* 2>/dev/null || true)
fi
if [ -n "$dirs" ]; then echo "leak: test state dirs left:"; echo "$dirs"; fail=1; fi
if [ $fail -eq 0 ]; then echo "leak check: clean"; fi
exit $fail
