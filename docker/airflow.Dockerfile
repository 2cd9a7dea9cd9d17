# The Airflow image with the DAG package baked in (the alternative to git-sync, see
# docs/deploy.md). The workers only build pod specs in kubernetes mode: they need the
# providers, not torch or the task packages. Build from the repository root:
#   docker build -f docker/airflow.Dockerfile -t REGISTRY/house-airflow:0.1.0 .
FROM apache/airflow:3.3.2-python3.11
COPY constraints.txt /opt/house/constraints.txt
RUN pip install --no-cache-dir -c /opt/house/constraints.txt \
      "apache-airflow==3.3.2" \
      "apache-airflow-providers-cncf-kubernetes==10.25.0" \
      "apache-airflow-providers-amazon[s3fs]==9.39.0"
COPY dags /opt/airflow/dags
COPY plugins /opt/airflow/plugins
