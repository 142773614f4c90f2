"""Flatness of trained models: filter-normalised loss slices and planes, interpolation paths
(``surfaces``), Hessian eigenvalue, trace and SAM sharpness (``hessian``), and their figures
(``plots``).
"""
