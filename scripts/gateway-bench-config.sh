# Sourced by the gateway benchmark scripts: the gateway configuration they
# share.
#
# bench_gateway_config GW_PORT UP_PORT Q W: a gateway on 127.0.0.1:GW_PORT
# in front of 127.0.0.1:UP_PORT, keyed by client IP, one token bucket of
# Q requests per W seconds, no shedding and no escalation (the peers it is
# compared with have neither), written to standard output.
bench_gateway_config() {
  cat <<CONF
key = "ip"
default_plan = "bench"

[gateway]
listen = "127.0.0.1:$1"
upstream = "http://127.0.0.1:$2"
watch = false

[gateway.shedding]
max_in_flight = 0

[plans.bench]
policies = [{ name = "burst", algorithm = "token_bucket", q = $3, w = $4 }]

[escalation]
enabled = false
CONF
}
