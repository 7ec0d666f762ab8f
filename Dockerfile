# The Kiln server image: `docker build -t kiln:0.1.0 .` (deploy/kubernetes/ runs it).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    KILN_HOST=0.0.0.0 \
    KILN_PORT=8080 \
    KILN_HOME=/var/lib/kiln

RUN groupadd --system --gid 10001 kiln \
    && useradd --system --uid 10001 --gid kiln --home-dir /var/lib/kiln --create-home --shell /usr/sbin/nologin kiln

WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install . && rm -rf /src

USER 10001:10001
WORKDIR /var/lib/kiln
EXPOSE 8080
ENTRYPOINT ["kiln"]
CMD ["server"]
