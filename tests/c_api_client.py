"""Runs a SavedModel through TensorFlow's C API, as TF Serving's C++ model server
loads it, from a Python that never imports tensorflow (only ctypes and numpy).

Run as a script by tests/test_c_api_loader.py, which sends a JSON plan on stdin:
    {"tensorflow_dir": the wheel's directory with libtensorflow_cc.so.2,
     "op_libraries": paths of custom-op libraries for TF_LoadLibrary,
     "export_dir": the SavedModel version directory,
     "runs": [{"feeds": [{"name": "op:index", "dtype": TF_DataType, "shape": [...],
                          "values": flat list, strings base64}],
               "fetches": [{"key": output key, "name": "op:index"}]}, ...]}
and prints one JSON line:
    {"unregistered_error": TF_LoadSessionFromSavedModel's message before the op
         libraries are loaded,
     "meta_graph_def": base64 of the MetaGraphDef the C API returned,
     "results": per run, {key: {"dtype", "shape", "values"}} in the same encoding,
     "modules": the top-level modules this process imported}.
"""

import base64
import ctypes
import json
import os
import sys

import numpy as np

# TF_DataType values (tensorflow/c/tf_datatype.h) of the dtypes our signatures use.
TF_FLOAT, TF_INT32, TF_STRING, TF_INT64, TF_BOOL = 1, 3, 7, 9, 10
NUMPY_DTYPES = {TF_FLOAT: np.float32, TF_INT32: np.int32, TF_INT64: np.int64, TF_BOOL: np.bool_}
# sizeof(TF_TString) (tensorflow/tsl/platform/ctstring_internal.h): a TF_STRING
# tensor's data is an array of these, each set with TF_StringInit and TF_StringCopy.
TSTRING_SIZE = 24
TF_OK = 0


class TF_Output(ctypes.Structure):
    _fields_ = [("oper", ctypes.c_void_p), ("index", ctypes.c_int)]


class TF_Buffer(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("length", ctypes.c_size_t),
                ("data_deallocator", ctypes.c_void_p)]


def load_c_api(tensorflow_dir):
    """The wheel's C API, with the argument and result types of what we call.

    libtensorflow_cc.so.2 exports the C API and brings in its neighbour
    libtensorflow_framework.so.2 (the op registry), which the tensorflow-text
    op libraries then find already loaded by its soname.
    """
    lib = ctypes.CDLL(os.path.join(tensorflow_dir, "libtensorflow_cc.so.2"))
    p, i64p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)
    signatures = {
        "TF_NewStatus": ([], p),
        "TF_GetCode": ([p], ctypes.c_int),
        "TF_Message": ([p], ctypes.c_char_p),
        "TF_LoadLibrary": ([ctypes.c_char_p, p], p),
        "TF_NewGraph": ([], p),
        "TF_NewSessionOptions": ([], p),
        "TF_NewBuffer": ([], ctypes.POINTER(TF_Buffer)),
        "TF_LoadSessionFromSavedModel": (
            [p, p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p), ctypes.c_int, p,
             ctypes.POINTER(TF_Buffer), p], p),
        "TF_GraphOperationByName": ([p, ctypes.c_char_p], p),
        "TF_SessionRun": (
            [p, p, ctypes.POINTER(TF_Output), ctypes.POINTER(p), ctypes.c_int,
             ctypes.POINTER(TF_Output), ctypes.POINTER(p), ctypes.c_int, p, ctypes.c_int, p, p],
            None),
        "TF_AllocateTensor": ([ctypes.c_int, i64p, ctypes.c_int, ctypes.c_size_t], p),
        "TF_DeleteTensor": ([p], None),
        "TF_TensorData": ([p], p),
        "TF_TensorType": ([p], ctypes.c_int),
        "TF_NumDims": ([p], ctypes.c_int),
        "TF_Dim": ([p, ctypes.c_int], ctypes.c_int64),
        "TF_TensorElementCount": ([p], ctypes.c_int64),
        "TF_StringInit": ([p], None),
        "TF_StringCopy": ([p, ctypes.c_char_p, ctypes.c_size_t], None),
        "TF_StringGetDataPointer": ([p], p),
        "TF_StringGetSize": ([p], ctypes.c_size_t),
        "TF_StringDealloc": ([p], None),
    }
    for name, (argtypes, restype) in signatures.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = argtypes, restype
    return lib


def check(lib, status, what):
    if lib.TF_GetCode(status) != TF_OK:
        raise RuntimeError(f"{what}: {lib.TF_Message(status).decode('utf-8', 'replace')}")


def load_session(lib, export_dir, status):
    """TF_LoadSessionFromSavedModel with tag "serve", as TF Serving calls it:
    restores the variables, runs the init op, returns the graph, the session and
    the serialized MetaGraphDef."""
    graph = lib.TF_NewGraph()
    meta_graph_def = lib.TF_NewBuffer()
    tags = (ctypes.c_char_p * 1)(b"serve")
    session = lib.TF_LoadSessionFromSavedModel(
        lib.TF_NewSessionOptions(), None, export_dir.encode(), tags, 1, graph,
        meta_graph_def, status)
    return graph, session, meta_graph_def.contents


def output(lib, graph, name):
    """The TF_Output of a tensor name "op:index"."""
    op_name, index = name.rsplit(":", 1)
    oper = lib.TF_GraphOperationByName(graph, op_name.encode())
    if not oper:
        raise RuntimeError(f"the graph has no operation {op_name!r}")
    return TF_Output(oper, int(index))


def new_tensor(lib, feed):
    """A TF_Tensor of a plan's feed; rank 0 is passed as num_dims=0."""
    shape = feed["shape"]
    dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    if feed["dtype"] == TF_STRING:
        values = [base64.b64decode(v) for v in feed["values"]]
        tensor = lib.TF_AllocateTensor(TF_STRING, dims, len(shape), TSTRING_SIZE * len(values))
        data = lib.TF_TensorData(tensor)
        for i, value in enumerate(values):
            lib.TF_StringInit(data + i * TSTRING_SIZE)
            lib.TF_StringCopy(data + i * TSTRING_SIZE, value, len(value))
        return tensor
    array = np.asarray(feed["values"], NUMPY_DTYPES[feed["dtype"]])
    tensor = lib.TF_AllocateTensor(feed["dtype"], dims, len(shape), array.nbytes)
    ctypes.memmove(lib.TF_TensorData(tensor), array.ctypes.data, array.nbytes)
    return tensor


def delete_tensor(lib, tensor, owns_strings):
    """TF_DeleteTensor frees a TF_AllocateTensor buffer without freeing the
    strings that TF_StringCopy put on the heap; those are ours to deallocate."""
    if owns_strings and lib.TF_TensorType(tensor) == TF_STRING:
        data = lib.TF_TensorData(tensor)
        for i in range(lib.TF_TensorElementCount(tensor)):
            lib.TF_StringDealloc(data + i * TSTRING_SIZE)
    lib.TF_DeleteTensor(tensor)


def read_tensor(lib, tensor):
    """A fetched TF_Tensor in the plan's JSON encoding."""
    shape = [lib.TF_Dim(tensor, d) for d in range(lib.TF_NumDims(tensor))]
    dtype, data, count = lib.TF_TensorType(tensor), lib.TF_TensorData(tensor), int(np.prod(shape))
    if dtype == TF_STRING:
        values = []
        for i in range(count):
            element = data + i * TSTRING_SIZE
            size = lib.TF_StringGetSize(element)
            values.append(base64.b64encode(
                ctypes.string_at(lib.TF_StringGetDataPointer(element), size)).decode())
        return {"dtype": "string", "shape": shape, "values": values}
    numpy_dtype = np.dtype(NUMPY_DTYPES[dtype])
    buffer = ctypes.string_at(data, count * numpy_dtype.itemsize)
    return {"dtype": numpy_dtype.name, "shape": shape,
            "values": np.frombuffer(buffer, numpy_dtype).tolist()}


def run(lib, graph, session, plan_run, status):
    """TF_SessionRun of one request: feeds only the request's inputs (the rest
    keep their PlaceholderWithDefault values, as in TF Serving) and fetches every
    output of the signature; a request the session refuses gives `{"error": its
    status code and message}`, and the session goes on to the next, as a model
    server answers a bad request and serves on."""
    feeds, fetches = plan_run["feeds"], plan_run["fetches"]
    inputs = (TF_Output * len(feeds))(*[output(lib, graph, f["name"]) for f in feeds])
    values = (ctypes.c_void_p * len(feeds))(*[new_tensor(lib, f) for f in feeds])
    outputs = (TF_Output * len(fetches))(*[output(lib, graph, f["name"]) for f in fetches])
    results = (ctypes.c_void_p * len(fetches))()
    lib.TF_SessionRun(session, None, inputs, values, len(feeds), outputs, results,
                      len(fetches), None, 0, None, status)
    for tensor in values:
        delete_tensor(lib, tensor, owns_strings=True)
    if lib.TF_GetCode(status) != TF_OK:
        return {"error": {"code": lib.TF_GetCode(status),
                          "message": lib.TF_Message(status).decode("utf-8", "replace")}}
    fetched = {}
    for fetch, tensor in zip(fetches, results):
        fetched[fetch["key"]] = read_tensor(lib, tensor)
        delete_tensor(lib, tensor, owns_strings=False)
    return fetched


def main():
    plan = json.loads(sys.stdin.read())
    lib = load_c_api(plan["tensorflow_dir"])
    status = lib.TF_NewStatus()
    # Before the op libraries: the load must fail on the tensorflow-text ops,
    # which shows that nothing else in this process registered them.
    load_session(lib, plan["export_dir"], status)
    unregistered_error = lib.TF_Message(status).decode("utf-8", "replace")
    for path in plan["op_libraries"]:
        lib.TF_LoadLibrary(path.encode(), status)
        check(lib, status, f"TF_LoadLibrary({path})")
    graph, session, meta_graph_def = load_session(lib, plan["export_dir"], status)
    check(lib, status, "TF_LoadSessionFromSavedModel")
    results = [run(lib, graph, session, plan_run, status) for plan_run in plan["runs"]]
    assert "tensorflow" not in sys.modules, "the C API client imported tensorflow"
    print(json.dumps({
        "unregistered_error": unregistered_error,
        "meta_graph_def": base64.b64encode(
            ctypes.string_at(meta_graph_def.data, meta_graph_def.length)).decode(),
        "results": results,
        "modules": sorted({m.split(".")[0] for m in sys.modules}),
    }))


if __name__ == "__main__":
    main()
