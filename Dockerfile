# kvtransit's agents (prefill, middlebox, decode, loadgen, kvpool): one image, the command picks the role.
#
#   docker compose up --build            # or docker-compose (v1): nothing on the host but Docker
#
# kvtransit and its dependencies come from the package index (PyPI), installed from this build context's
# source; the base from the registry (python:3.11-slim: numpy, scipy, pyfftw, uvloop and crc32c all ship
# cp311 manylinux wheels, so nothing is compiled). With no registry or index, Dockerfile.offline installs from
# a host wheelhouse (docker-compose.offline.yml selects it). Written for the legacy builder too (docker-compose
# v1 without BuildKit): no RUN --mount, no heredocs.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# tc shapes the link inside the container (cap_add NET_ADMIN); python:3.11-slim lacks iproute2.
RUN command -v tc >/dev/null \
    || (apt-get update && apt-get install -y --no-install-recommends iproute2 && rm -rf /var/lib/apt/lists/*)

# The dependencies first, in a layer of their own, read from pyproject.toml (tomllib: Python 3.11), so an edit
# under src/ rebuilds only the last layer instead of downloading numpy and scipy again.
WORKDIR /tmp/kvtransit-src
COPY pyproject.toml README.md ./
RUN python3 -m venv /opt/kvtransit \
    && python3 -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
       > /tmp/requirements.txt \
    && /opt/kvtransit/bin/pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
COPY src ./src
RUN /opt/kvtransit/bin/pip install --no-cache-dir --no-deps . \
    && cd / && rm -rf /tmp/kvtransit-src
WORKDIR /
ENV PATH=/opt/kvtransit/bin:$PATH \
    PYTHONUNBUFFERED=1

COPY docker/entrypoint.sh /usr/local/bin/kvtransit-entrypoint
COPY docker/shape_egress.py /usr/local/lib/kvtransit/shape_egress.py
ENTRYPOINT ["kvtransit-entrypoint"]
CMD ["kvtransit", "--help"]
