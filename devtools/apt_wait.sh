#!/usr/bin/env bash
# apt_wait.sh SECONDS ARGS...: apt-get ARGS, waiting up to SECONDS while another apt-get or dpkg
# holds the package lock (a shared machine, unattended upgrades) instead of failing at once. It says
# that it waits and for what; past SECONDS it fails naming the lock. Any other failure is apt-get's own.
set -u
limit=$1; shift
deadline=$(( $(date +%s) + limit ))
said=
while :; do
  out=$(apt-get -o DPkg::Lock::Timeout=5 "$@" 2>&1); rc=$?
  if [ $rc -eq 0 ]; then printf '%s' "$out" | grep -v '^$' || true; exit 0; fi
  if ! printf '%s' "$out" | grep -qiE 'could not (get|open) lock|unable to (acquire|lock)|is another process using it'; then
    printf '%s\n' "$out" >&2; exit $rc
  fi
  # whole seconds: past the deadline (not at it), so the wait is never shorter than SECONDS
  if [ "$(date +%s)" -gt "$deadline" ]; then
    printf '%s\n' "$out" >&2
    echo "apt_wait: the package lock was still held after ${limit} s (another apt-get or dpkg is running); nothing was installed" >&2
    exit $rc
  fi
  [ -n "$said" ] || { echo "apt_wait: another apt-get or dpkg holds the package lock; waiting up to ${limit} s" >&2; said=1; }
  sleep 5
done
