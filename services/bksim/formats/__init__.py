"""Bytes on disk and on the wire. Pure functions shared by the bookie, the client and the audit job."""
