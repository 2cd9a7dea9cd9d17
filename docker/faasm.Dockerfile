# Image for `python -m faasm_tasks <step>` pods (deploy, load driver, collect, teardown).
# Build from the repository root:
#   docker build -f docker/faasm.Dockerfile -t REGISTRY/faasm-tasks:0.1.0 .
# Debian bookworm base: the apt pin below is that release's wrk (hadolint DL3008).
FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN apt-get update && apt-get install -y --no-install-recommends 'wrk=4.1.0-3*' && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/house
COPY constraints.txt docker/requirements-faasm.txt ./
RUN pip install -r requirements-faasm.txt -c constraints.txt
# The packages are installed, not put on PYTHONPATH (their dependencies came from
# requirements-faasm.txt); the source copy is removed so only the installed one imports.
WORKDIR /tmp/src
COPY pyproject.toml README.md ./
COPY docker ./docker
COPY stepkit ./stepkit
COPY mirage_tasks ./mirage_tasks
COPY faasm_tasks ./faasm_tasks
WORKDIR /opt/house
RUN pip install --no-deps /tmp/src && rm -rf /tmp/src
RUN useradd --uid 10001 --create-home runner && python -m faasm_tasks --help >/dev/null
USER 10001
ENTRYPOINT []
CMD ["python", "-m", "faasm_tasks", "--help"]
