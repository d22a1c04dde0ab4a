package fails

import "testing"

func TestFails(t *testing.T) { t.Error("the answer is 41") }

func TestSkips(t *testing.T) { t.Skip("nothing to see") }
