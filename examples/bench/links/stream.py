"""A plain TCP stream, the yardstick of what a simulated link really delivers.

    stream.py recv HOST PORT          # prints the Gbit/s of goodput received, then exits
    stream.py send HOST PORT SECONDS  # sends zeros for SECONDS

run.py starts one receiver and one sender per host, host i sending to host
i+1, so that every link carries a stream each way at once, as the ring's do.
"""

import socket
import sys
import time


def recv(host, port):
    ln = socket.socket()
    ln.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ln.bind((host, port))
    ln.listen(1)
    ln.settimeout(30)  # a sender that never comes fails the run instead of hanging it
    print("listening", flush=True)
    c, _ = ln.accept()
    c.settimeout(None)
    buf = bytearray(1 << 20)
    n, t0, t1 = 0, None, None
    while True:
        k = c.recv_into(buf)
        if not k:
            break
        t1 = time.perf_counter()
        if t0 is None:
            t0 = t1  # from the first byte: the connection's setup is not the link's
            continue
        n += k
    print("%.4f" % (n * 8 / (t1 - t0) / 1e9 if t1 and t1 > t0 else 0), flush=True)


def send(host, port, secs):
    c = socket.create_connection((host, port))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    b = bytes(1 << 20)
    end = time.perf_counter() + secs
    while time.perf_counter() < end:
        c.sendall(b)
    c.close()


if __name__ == "__main__":
    if sys.argv[1] == "recv":
        recv(sys.argv[2], int(sys.argv[3]))
    else:
        send(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
