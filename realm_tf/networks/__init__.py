"""realm_tf.networks."""
