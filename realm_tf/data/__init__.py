"""realm_tf.data."""
