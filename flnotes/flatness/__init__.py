"""Flatness of trained models: filter-normalised loss slices and planes, interpolation paths
(``surfaces``), Hessian eigenvalue, trace and SAM sharpness (``hessian``), and their figures
(``plots``); and how local gradients align with the global one during local training
(``gradients``: FedUp Table 2's ablation of Mime's correction).
"""
