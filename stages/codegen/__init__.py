"""LLVM code generation shared by every template: loops, harness, compile, load."""
