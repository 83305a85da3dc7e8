"""The Beam jobs of realm_tf: each module is a job, run as ``python -m beam_jobs.<job>`` or through ``realm-tf``.

Importing the package first drops Beam's known-harmless import-time messages (a missing GCS or BigQuery client:
"Failed to import GCSFileSystem", "apitools not found"), which Beam writes while ``apache_beam`` itself is being
imported, before any job module could filter them. ``REALM_TF_VERBOSE=1`` keeps them."""
from realm_tf import library_logs

library_logs.quiet_known_noise(find_devices=False)
