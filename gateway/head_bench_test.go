package gateway

import (
	"bufio"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// The check every data-plane request passes before its route (one pass
// over the head's lines), on the heads of a CDI importer's range read and
// of a tus PATCH. Run with -bench HeadCheck; it allocates nothing.
func BenchmarkHeadCheck(b *testing.B) {
	for name, head := range map[string]string{
		"fetch": "GET /market/vm-images/fetch/" + strings.Repeat("a", 24) + " HTTP/1.1\r\nHost: edge.example:8480\r\n" +
			"User-Agent: cdi-nbdkit-importer\r\nAccept: */*\r\nAccept-Encoding: identity\r\n" +
			"Authorization: Bearer " + strings.Repeat("b", 64) + "\r\nRange: bytes=1048576-2097151\r\n\r\n",
		"patch": "PATCH /market/vm-images/upload-sessions/" + strings.Repeat("c", 64) + " HTTP/1.1\r\nHost: edge.example:8480\r\n" +
			"User-Agent: tus-js-client\r\nTus-Resumable: 1.0.0\r\nUpload-Offset: 67108864\r\n" +
			"Content-Type: application/offset+octet-stream\r\nContent-Length: 67108864\r\nOrigin: https://edge.example\r\n\r\n",
	} {
		b.Run(name, func(b *testing.B) {
			var ctx fasthttp.RequestCtx
			if err := ctx.Request.Header.Read(bufio.NewReader(strings.NewReader(head))); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if aerr := headRefusal(&ctx); aerr != nil {
					b.Fatal(aerr)
				}
			}
		})
	}
}
