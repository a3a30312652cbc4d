"""Swagger UI and ReDoc, vendored so that ``/docs`` and ``/redoc`` work offline.

See README.md beside this file for where each file comes from and its license.
"""
