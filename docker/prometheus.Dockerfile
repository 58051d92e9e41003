# Prometheus for the OFFLINE compose path (docker-compose.offline.yml; the default path runs the official
# prom/prometheus image): Debian's binary (docker/fetch-prometheus.sh: apt-get download + dpkg-deb -x; it links
# only libc) on the same base as the agents, so no image has to be pulled. The config and rules are mounted
# from prometheus/ by docker-compose.yml, not baked in, and the flags are the compose file's `command`.
ARG BASE_IMAGE=kvtransit-base:bookworm
FROM ${BASE_IMAGE}
COPY docker/prometheus-bin/prometheus /usr/local/bin/prometheus
RUN mkdir -p /prometheus
EXPOSE 9090
ENTRYPOINT ["prometheus"]
CMD ["--config.file=/etc/kvtransit/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus", \
     "--web.listen-address=0.0.0.0:9090"]
