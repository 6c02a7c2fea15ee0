"""`itlaudit track`: a history of builds (points keyed by a full fingerprint, raw samples kept), the
series over it and their change points, validity first. Storage in db.py, run folders in record.py,
the pure series and change-point rules in changes.py."""
