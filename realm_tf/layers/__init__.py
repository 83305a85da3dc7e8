"""realm_tf.layers."""
