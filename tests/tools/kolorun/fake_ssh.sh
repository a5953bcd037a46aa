#!/bin/sh
# Stand-in for ssh in kolorun's tests (installed as "ssh" first in PATH).
#
# Records its arguments in "$FAKE_SSH_LOG.<pid>", one per line. For a host
# listed in $FAKE_SSH_FAIL it fails as ssh does (a message, exit 255).
# Otherwise it runs the remote command (its last argument) on this machine
# with a clean environment, as sshd would, and stays its parent as ssh does:
# the command keeps this process's standard input (kolorun's request pipe),
# and when kolorun dies this process dies with it (PR_SET_PDEATHSIG), which
# leaves the command to notice its standard input closing.
if [ -n "${FAKE_SSH_LOG:-}" ]; then
  printf '%s\n' "$@" > "$FAKE_SSH_LOG.$$"
fi
for last; do :; done
n=$#
host=$(eval "printf %s \"\${$((n - 1))}\"")
for failing in ${FAKE_SSH_FAIL:-}; do
  if [ "$host" = "$failing" ]; then
    echo "ssh: connect to host $host port 22: Connection refused" >&2
    exit 255
  fi
done
exec 3<&0
env -i HOME="${HOME:-/}" PATH=/usr/bin:/bin LOGNAME=fake USER=fake \
  SHELL=/bin/sh sh -c "$last" <&3 3<&- &
wait $!
