#!/bin/sh
# A Compose agent's start, as root, so that its generators can run as another user
# (--generator-user) who learns none of its secrets:
#   agent-entry.sh SECRET COMMAND...
# 1. the broker password /run/secrets/SECRET must be 0600 (the generators' user
#    must not read it where Compose mounts it: compose/README.md says how);
# 2. it is copied into /run/framespool (0700, root's), where the agent reads it
#    (FRAMESPOOL_KAFKA_SASL_PASSWORD_FILE); the agent itself then refuses to
#    start while its generators' user could read a secret of its own;
# 3. COMMAND runs.
set -eu
secret="/run/secrets/$1"
shift
mode=$(stat -c %a "$secret")
if [ "$mode" != 600 ] && [ "$mode" != 400 ]; then
  echo "agent-entry: $secret is mode $mode: generators could read it; chmod 600 (and chown 10001) the file under compose/secrets" >&2
  exit 1
fi
umask 077
install -d -m 700 /run/framespool
install -m 600 "$secret" /run/framespool/kafka-password
export FRAMESPOOL_KAFKA_SASL_PASSWORD_FILE=/run/framespool/kafka-password
exec "$@"
