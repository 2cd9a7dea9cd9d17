# The Airflow image with the DAG package baked in; with deploy/helm/values-bundle.yaml the DAG
# files come from git as a versioned DAG bundle instead (the git provider below, which drives
# the image's git), while plugins/house and the task packages still come from here
# (docs/deploy.md). In kubernetes mode the steps run in their own images; the Airflow
# components still import the task packages' light modules: the Mirage DAG files build their
# forms from mirage_tasks.run.runconf at parse time, and the plan tasks (mirage_tasks.run.plan) run on
# the workers. Those modules need only the standard library, fsspec (which the Amazon
# provider's s3fs extra brings) and jsonschema (an Airflow dependency: the plan task checks the
# params with it), so the packages are installed without their dependencies: no
# torch, numpy or pandas in this image. Build from the repository root:
#   docker build -f docker/airflow.Dockerfile -t REGISTRY/house-airflow:0.1.0 .
FROM apache/airflow:3.3.2-python3.11
COPY constraints.txt /opt/house/constraints.txt
RUN pip install --no-cache-dir -c /opt/house/constraints.txt \
      "apache-airflow==3.3.2" \
      "apache-airflow-providers-cncf-kubernetes==10.25.0" \
      "apache-airflow-providers-amazon[s3fs]==9.39.0" \
      "apache-airflow-providers-git==1.0.1"
COPY --chown=airflow:root pyproject.toml README.md /tmp/src/
COPY --chown=airflow:root docker /tmp/src/docker
COPY --chown=airflow:root stepkit /tmp/src/stepkit
COPY --chown=airflow:root mirage_tasks /tmp/src/mirage_tasks
COPY --chown=airflow:root faasm_tasks /tmp/src/faasm_tasks
RUN pip install --no-cache-dir --no-deps /tmp/src && rm -rf /tmp/src \
    && python -c "import mirage_tasks.run.runconf, mirage_tasks.run.plan"
COPY dags /opt/airflow/dags
COPY plugins /opt/airflow/plugins
