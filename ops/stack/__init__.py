"""The local stack, what `memstream stack` and the benchmarks run on this machine: Kafka and
Redis started and stopped (`services`), the topics created before workers start
(`kafka_admin`), and `memstream worker` subprocesses (`processes`). The resources they read
stay in ops/: the Kafka jars' ops/kafka/pom.xml, and ops/prometheus.yml and ops/grafana for
docker-compose."""
