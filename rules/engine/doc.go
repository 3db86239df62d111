// Package engine is the daemon's own TCP and UDP proxy: for each Service port a listener on the node that
// forwards what it receives to an endpoint. Mode userspace points its capture rules at these listeners;
// the same engine can serve any other front (mode nftables' localhost NodePorts).
//
// TCP: each accepted connection goes to the next endpoint in round-robin order, or to the one the client
// used last when ClientIP affinity is on and its timeout has not passed. A connect that fails or times out
// moves on to the next endpoint, each tried at most once. Bytes move between the two sockets with
// splice(2), as io.Copy between two *net.TCPConn would move them, but through pipes taken from a pool only
// while bytes are in flight: io.Copy holds a pipe per direction for a connection's whole life, which made an
// idle connection cost six descriptors instead of two (measured). A half-close (EOF in one direction) is
// passed on with shutdown(SHUT_WR). A connection idle in both directions for longer than the idle timeout is closed; the
// kernel's TCP_INFO says how long each socket has been idle, so copying keeps its zero-copy path.
//
// UDP: one upstream socket per client address, kept while packets flow and closed once idle for the UDP
// idle timeout. Replies leave from the listener socket with the address the client's packet was delivered
// to as their source, so that conntrack turns them back into replies from the Service address. The
// upstream sockets of every flow are watched by one epoll goroutine per engine: an idle flow costs a socket
// and a map entry, and a UDP listener its socket and its reader goroutine.
//
// Endpoints replaced: new connections go only to the new set; established ones keep running until they end
// (counted as draining). Limits on concurrent connections per listener and in total protect the node (its
// file descriptors above all); a connection over a limit is reset at once, counted, and logged.
//
// Restarts: with a socket store (Options.Sockets: systemd's file descriptor store) each listener's socket
// is kept there under a name made of its family and key (SocketName), and the daemon's next process takes
// it up instead of opening another, so the listener keeps its port. At stop, Drain closes the engine's
// copies (the stored sockets stay open, and what arrives meanwhile waits in their queues for the next
// process) and lets the connections and flows under way finish.
package engine
