"""Shared test set-up: tf-models needs Keras 2 (tf_keras), chosen before TensorFlow is first imported."""
import os
import pathlib
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.chdir(REPO)  # configs name bundled data by repo-relative paths
