"""realm_tf.index."""
