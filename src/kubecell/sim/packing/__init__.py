"""The static packing experiment of the FGD paper: pods arrive one by one, never leave, never retry."""
