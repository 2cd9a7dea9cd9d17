# Image for `python -m mirage_tasks <step>` pods (KubernetesPodOperator, runner=kubernetes).
# Build from the repository root:
#   docker build -f docker/mirage.Dockerfile -t REGISTRY/mirage-tasks:0.1.0 .
# PyPI's Linux torch wheel bundles CUDA, so the same image serves the cpu-* and gpu presets.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /opt/house
COPY constraints.txt docker/requirements-mirage.txt ./
RUN pip install -r requirements-mirage.txt -c constraints.txt
# The packages are installed, not put on PYTHONPATH (their dependencies came from
# requirements-mirage.txt); the source copy is removed so only the installed one imports.
WORKDIR /tmp/src
COPY pyproject.toml README.md ./
COPY docker ./docker
COPY stepkit ./stepkit
COPY mirage_tasks ./mirage_tasks
COPY faasm_tasks ./faasm_tasks
WORKDIR /opt/house
RUN pip install --no-deps /tmp/src && rm -rf /tmp/src
RUN useradd --uid 10001 --create-home runner && python -m mirage_tasks --help >/dev/null
USER 10001
ENTRYPOINT []
CMD ["python", "-m", "mirage_tasks", "--help"]
