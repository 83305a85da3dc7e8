"""realm_tf.serving."""
