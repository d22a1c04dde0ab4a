package passes

import "testing"

func TestPasses(t *testing.T) {}
