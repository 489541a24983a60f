# posttrain-exporter: the sidecar image the Helm chart (helm/posttrain-exporter) runs.
#   docker build -t ghcr.io/posttrain-exporter/posttrain-exporter:0.1.0 .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
# the kubernetes extra: `--log k8s://...` follows the trainer container's log through the API (no `| tee`)
RUN pip install '.[kubernetes]' && rm -rf /src

# A fixed numeric user, so that Kubernetes' runAsNonRoot can check it (the chart sets runAsUser 10001 too).
RUN groupadd --system --gid 10001 exporter \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin exporter
USER 10001:10001
WORKDIR /

EXPOSE 9847
ENTRYPOINT ["posttrain-exporter"]
CMD ["--help"]
