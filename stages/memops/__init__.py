"""Generated code for the memory-bound ops of a model (element-wise, layout, reductions, generic anchors):
loop nests over static shapes, one function per node, called by the library's run entry."""
