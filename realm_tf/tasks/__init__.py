"""realm_tf.tasks."""
