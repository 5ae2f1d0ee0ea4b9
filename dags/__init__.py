"""Airflow DAG factory and DAG files (imports go dags -> pipelines -> components -> cache).

The DAG factory arrives with the Airflow issue; this package exists now so the layout and packaging are fixed.
"""
