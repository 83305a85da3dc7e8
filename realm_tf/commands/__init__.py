"""The commands of ``realm-tf``, one module per area; ``realm_tf.cli`` generates the command line from them."""
