"""Packaging for realm_tf: REALM (Guu et al., 2020) in TensorFlow 2 / Keras.

The pins below are the project's fixed stack (README, "Stack"); they are known to co-install (ScaNN's TF op
and pybind module both load against TensorFlow 2.20).
"""
import setuptools

STACK = [
    "tensorflow~=2.20.0",
    "tensorflow-text~=2.20.0",
    "tf-models-official==2.20.0",
    "scann[tf]==1.4.2",
    "apache-beam==2.77.0",
    "google-crc32c",  # Beam's TFRecord IO checksums records with it (C implementation)
    "tensorboard",
    "tensorflow-serving-api~=2.20.0",  # TF Serving's PredictionLog for the exports' warm-up records
    "safetensors",
    "numpy",
    "pyyaml",
    "tqdm",
]

setuptools.setup(
    name="realm-tf",
    version="0.1.0",
    license="Apache-2.0",
    description="REALM: Retrieval-Augmented Language Model pre-training in TensorFlow 2 / Keras",
    python_requires=">=3.11,<3.12",
    packages=setuptools.find_packages(include=["realm_tf", "realm_tf.*", "beam_jobs", "beam_jobs.*"]),
    install_requires=STACK,
    extras_require={
        "dev": ["pytest", "pytest-timeout", "pytest-xdist", "hypothesis", "bm25s", "ruff==0.17.6"],
        "gcp": ["apache-beam[gcp]==2.77.0"],
        "gpu": ["tensorflow[and-cuda]~=2.20.0"],  # CUDA and cuDNN from PyPI (Linux)
    },
    entry_points={"console_scripts": ["realm-tf=realm_tf.cli:main"]},
)
