"""rules_java shim: forwards to the native Java rules (only Bazel's own tools load it)."""

java_binary = native.java_binary
java_import = native.java_import
java_library = native.java_library
java_plugin = native.java_plugin
java_runtime = native.java_runtime
java_test = native.java_test
java_toolchain = native.java_toolchain
java_proto_library = native.java_proto_library
java_lite_proto_library = native.java_lite_proto_library
