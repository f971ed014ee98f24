"""Models as layer lists: parameter tensors and forward FLOPs per layer, and their compute
time (model: Layer and Workload; transformer: a transformer's layers; presets: the named
models and building a Workload from a name or a spec).

A layer here is the unit the timeline schedules: a transformer block, an embedding, a ResNet
conv or batch norm. It lists its parameter tensors, the units DDP buckets, in registration
order (as `module.parameters()` yields them, a shared tensor once). FLOPs are per sample (one
sequence for a transformer, one image for a CNN) and count a multiply-add as 2 FLOPs.
Backward costs 2x forward (the gradient with respect to activations plus the one with
respect to weights), which gives the standard training cost of 6 FLOPs per parameter per
token (Kaplan et al. 2020, arXiv:2001.08361). Only matrix multiplications count; element-wise
work (norms, activations, softmax, residual adds) is left out, as Narayanan et al. 2021
(arXiv:2104.04473) do.
"""
