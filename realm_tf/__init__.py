"""realm_tf: REALM (Retrieval-Augmented Language Model pre-training, Guu et al. 2020) in TensorFlow 2.

tf-models-official builds on tf_keras (Keras 2). TensorFlow decides which Keras `tf.keras` means when it is
first imported, so the switch is set here, before any submodule imports TensorFlow.
"""
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__version__ = "0.1.0"
