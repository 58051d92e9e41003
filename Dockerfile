# kvtransit's agents (prefill, middlebox, decode, loadgen): one image, the command picks the role.
#
#   docker/build-wheelhouse.sh                      # wheels built on the host: the build needs no network
#   docker-compose build                            # FROM python:3.11-slim by default
#   docker-compose build --build-arg BASE_IMAGE=kvtransit-base:bookworm   # no registry: docker/build-base.sh
#
# Written for the legacy builder too (Debian's docker 20.10 has no buildx): no RUN --mount, no heredocs.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# tc shapes the link inside the container (cap_add NET_ADMIN). python:3.11-slim lacks iproute2; the
# debootstrap base has it, so there this step runs nothing and needs no network.
RUN command -v tc >/dev/null \
    || (apt-get update && apt-get install -y --no-install-recommends iproute2 && rm -rf /var/lib/apt/lists/*)

COPY docker/wheelhouse /tmp/wheelhouse
RUN python3 -m venv /opt/kvtransit \
    && /opt/kvtransit/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheelhouse kvtransit \
    && rm -rf /tmp/wheelhouse
ENV PATH=/opt/kvtransit/bin:$PATH \
    PYTHONUNBUFFERED=1

COPY docker/entrypoint.sh /usr/local/bin/kvtransit-entrypoint
COPY docker/shape_egress.py /usr/local/lib/kvtransit/shape_egress.py
ENTRYPOINT ["kvtransit-entrypoint"]
CMD ["kvtransit", "--help"]
