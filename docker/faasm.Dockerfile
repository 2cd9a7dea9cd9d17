# Image for `python -m faasm_tasks <step>` pods (deploy, load driver, collect, teardown).
# Build from the repository root:
#   docker build -f docker/faasm.Dockerfile -t REGISTRY/faasm-tasks:0.1.0 .
# Debian bookworm base: the apt pins below are that release's packages (hadolint DL3008).
# Stage 1 builds the Faasm functions (faasm_tasks/functions): wasm32-wasi and native static.
FROM debian:bookworm-slim AS functions
RUN apt-get update && apt-get install -y --no-install-recommends 'clang=1:14.0-55.7*' 'lld=1:14.0-55.7*' \
      'wasi-libc=0.0~git20220510.9886d3d-2*' 'libclang-rt-14-dev-wasm32=1:14.0.6-12*' 'gcc=4:12.2.0-3*' \
      'libc6-dev=2.36-9*' 'make=4.3-4.1*' && rm -rf /var/lib/apt/lists/*
COPY faasm_tasks/functions /src/functions
RUN make -C /src/functions

FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN apt-get update && apt-get install -y --no-install-recommends 'wrk=4.1.0-3*' 'runc=1.1.5*' && rm -rf /var/lib/apt/lists/*
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
COPY --from=functions /src/functions/build ./faasm_tasks/functions/build
WORKDIR /opt/house
RUN pip install --no-deps /tmp/src && rm -rf /tmp/src
RUN useradd --uid 10001 --create-home runner && python -m faasm_tasks --help >/dev/null
USER 10001
ENTRYPOINT []
CMD ["python", "-m", "faasm_tasks", "--help"]
