package gateway

import (
	"net"
	"strings"
)

type netConn = net.Conn

func netDial(base string) (net.Conn, error) {
	return net.Dial("tcp", strings.TrimPrefix(base, "http://"))
}
