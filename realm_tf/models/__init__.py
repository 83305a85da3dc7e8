"""realm_tf.models."""
