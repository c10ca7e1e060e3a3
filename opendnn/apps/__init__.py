"""Applications built on opendnn: the ``opendnn`` command (``cli``), the digits training demo
(``demo``), the problem-at-a-time driver (``bench``) and the data-parallel trainer
(``data_parallel``). They use the library's public API; nothing in the library imports them."""
