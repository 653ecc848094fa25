"""rules_proto shim: forwards to the native proto rules.

pipe does not use them (see tools/pp.bzl, whose proto rule runs the system protoc);
only Bazel's own tools load this file.
"""

proto_library = native.proto_library
proto_lang_toolchain = native.proto_lang_toolchain
