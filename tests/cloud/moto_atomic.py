"""moto's S3 server, with conditional writes decided atomically as S3 decides them.

moto checks a PUT's If-Match or If-None-Match and then writes, in two steps, on a thread per
request: two concurrent compare-and-set writes can both pass the check, and one of them is lost.
(object_store's `put_opts` test, 50 concurrent compare-and-set increments of one counter, lost
one in a CI dry run on a loaded machine, 2026-12-04.) Weir's metadata log slots and job queue
rely on the bucket deciding a condition and its write as one step, so the tests run moto with
every object-level request handled under one lock.

    python tests/cloud/moto_atomic.py -H 127.0.0.1 -p PORT      # moto_server's arguments
"""

import sys
import threading

from moto.s3.responses import S3Response
from moto.server import main

_LOCK = threading.Lock()
_key_response = S3Response._key_response


def _one_at_a_time(self, *args, **kwargs):
    with _LOCK:
        return _key_response(self, *args, **kwargs)


S3Response._key_response = _one_at_a_time

if __name__ == "__main__":
    sys.exit(main())
