# printery-workers in a container: small (python slim, no compiler, no cache), non-root.
#
#   docker build -t printery .
#   docker run --rm -p 9464:9464 printery                     # embedded server, data in the volume
#   docker run --rm -p 9464:9464 -e REDIS_URL=redis://redis:6379/0 printery   # your Redis
#
# The operator's tool is in the same image:
#   docker run --rm -e REDIS_URL=... --entrypoint printery printery status
# Your own pipeline: mount or copy its module under /app and set PRINTERY_APP=module:attr
# (the working directory is on the import path, as for `printery-workers --app`).
# Checked by tests/e2e/test_deploy_files.py, which runs this ENTRYPOINT/CMD with this ENV.

FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY src ./src
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
RUN pip install /wheels/*.whl && rm -rf /wheels \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/printery --create-home printery
WORKDIR /app
COPY examples ./examples
# The embedded server's data (used when REDIS_URL is unset) lives in the volume.
VOLUME /var/lib/printery
ENV PRINTERY_DATA_DIR=/var/lib/printery \
    HTTP_ADDR=0.0.0.0:9464 \
    SHUTDOWN_TIMEOUT=30
EXPOSE 9464
USER 10001:10001
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9464/readyz', timeout=2)"]
ENTRYPOINT ["printery-workers"]
CMD ["--supervised"]
