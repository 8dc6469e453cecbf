# The framespool image: every framespool process (API, processors, clock, agents) runs from
# it with a different command; see compose/docker-compose.yml.
FROM python:3.11.7-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# An unprivileged user owns the state directories; named volumes mounted there inherit it.
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/framespool \
        framespool \
    && mkdir -p /stack /data \
    && chown framespool:framespool /stack /data

COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY producers ./producers
COPY processors ./processors
COPY agents ./agents
COPY projections ./projections
COPY framespool ./framespool
COPY compose ./compose
# Editable, so the dashboard's static files (projections/dashboard) are served from /app.
RUN pip install -e .

USER framespool
EXPOSE 8080
CMD ["python", "-m", "framespool.services", "--help"]
