#!/bin/sh
# The Compose broker's start (entrypoint of the kafka service, apache/kafka image):
# one KRaft node, SASL_PLAINTEXT on every listener, StandardAuthorizer with no
# access where no ACL allows it. The super user "admin" logs in by PLAIN (its
# password, the secret kafka-admin, is in this node's JAAS settings): the broker
# to its controller and init, which creates each service's SCRAM-SHA-512
# principal and its ACLs (compose/init_stack.py). The SASL and ACL settings are
# init_stack.broker_security's; tests/unit/test_compose_acls.py checks they match.
set -eu
umask 077
conf=/tmp/framespool-kafka
mkdir -p "$conf"
pw=$(cat /run/secrets/kafka-admin)
case "$pw" in
  *[!A-Za-z0-9]*|"") echo "kafka-start: /run/secrets/kafka-admin must be letters and digits (openssl rand -hex 24)" >&2; exit 1 ;;
esac
plain="org.apache.kafka.common.security.plain.PlainLoginModule required username=\"admin\" password=\"$pw\" user_admin=\"$pw\";"
scram="org.apache.kafka.common.security.scram.ScramLoginModule required;"
cat > "$conf/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@kafka:9093
listeners=INTERNAL://:9092,CONTROLLER://:9093,EXTERNAL://:29092
advertised.listeners=INTERNAL://kafka:9092,EXTERNAL://localhost:${KAFKA_EXTERNAL_PORT:-29092}
inter.broker.listener.name=INTERNAL
controller.listener.names=CONTROLLER
listener.security.protocol.map=INTERNAL:SASL_PLAINTEXT,EXTERNAL:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=PLAIN
sasl.mechanism.controller.protocol=PLAIN
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=$plain
listener.name.internal.plain.sasl.jaas.config=$plain
listener.name.internal.scram-sha-512.sasl.jaas.config=$scram
listener.name.external.plain.sasl.jaas.config=$plain
listener.name.external.scram-sha-512.sasl.jaas.config=$scram
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:admin
auto.create.topics.enable=false
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
log.dirs=/var/lib/kafka/data
PROPS
# the health check's client (kafka-broker-api-versions.sh --command-config)
cat > "$conf/admin.properties" <<PROPS
security.protocol=SASL_PLAINTEXT
sasl.mechanism=PLAIN
sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="$pw";
PROPS
/opt/kafka/bin/kafka-storage.sh format --ignore-formatted --cluster-id "$CLUSTER_ID" --config "$conf/server.properties"
exec /opt/kafka/bin/kafka-server-start.sh "$conf/server.properties"
