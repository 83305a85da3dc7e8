"""TF Serving's PredictionLog read with message classes built here from the fields of
tensorflow_serving/apis/{prediction_log,predict,model}.proto, independently of the tensorflow-serving-api classes
realm_tf writes with: the reference the warm-up tests compare against. A helper of tests/serving (tests are not a
package)."""
import tensorflow as tf
from google.protobuf import descriptor_pb2
from google.protobuf import descriptor_pool
from google.protobuf import message_factory
from tensorflow.core.framework import tensor_pb2


def _prediction_log_class():
    proto = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="serving_subset.proto", package="serving_subset", syntax="proto3")

    def message(name, fields, nested=()):
        m = file.message_type.add(name=name)
        for nested_name, nested_fields in nested:
            entry = m.nested_type.add(name=nested_name)
            entry.options.map_entry = True
            for field_name, number, kind in nested_fields:
                entry.field.add(name=field_name, number=number, type=kind, label=proto.LABEL_OPTIONAL)
        for field_name, number, kind, type_name, label in fields:
            field = m.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                field.type_name = type_name

    optional, repeated = proto.LABEL_OPTIONAL, proto.LABEL_REPEATED
    message("ModelSpec", [("name", 1, proto.TYPE_STRING, "", optional),
                          ("signature_name", 3, proto.TYPE_STRING, "", optional)])
    # map<string, TensorProto> inputs = 2: the TensorProto kept as bytes (the same wire format), parsed below.
    message("PredictRequest", [("model_spec", 1, proto.TYPE_MESSAGE, ".serving_subset.ModelSpec", optional),
                               ("inputs", 2, proto.TYPE_MESSAGE, ".serving_subset.PredictRequest.InputsEntry",
                                repeated)],
            nested=[("InputsEntry", [("key", 1, proto.TYPE_STRING), ("value", 2, proto.TYPE_BYTES)])])
    message("PredictLog", [("request", 1, proto.TYPE_MESSAGE, ".serving_subset.PredictRequest", optional)])
    message("PredictionLog", [("predict_log", 6, proto.TYPE_MESSAGE, ".serving_subset.PredictLog", optional)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("serving_subset.PredictionLog"))


def parse_prediction_log(serialized):
    """``(signature_name, {input name: numpy array})`` of a serialized ``tensorflow.serving.PredictionLog``."""
    log = _prediction_log_class().FromString(serialized)
    request = log.predict_log.request
    return request.model_spec.signature_name, {
        name: tf.make_ndarray(tensor_pb2.TensorProto.FromString(value)) for name, value in request.inputs.items()}
