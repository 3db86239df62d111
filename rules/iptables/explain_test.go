package iptables

import (
	"testing"

	v1 "k8s.io/api/core/v1"

	"kube-proxy/proxy"
)

func TestServiceOfComment(t *testing.T) {
	named := proxy.ServicePortName{NamespacedName: nn("web"), Port: "http", Protocol: v1.ProtocolTCP}
	st := newSvcState(named)
	for comment, want := range map[string]string{
		st.name + " cluster IP":                    "default/web:http",
		st.name + " -> 10.244.1.2:8080":            "default/web:http",
		"other traffic to " + st.name + " will be": "",
		"kube-system/dns.v2":                       "kube-system/dns.v2",
		"kubernetes service portals":               "",
		"":                                         "",
	} {
		if got := ServiceOfComment(comment); got != want {
			t.Errorf("ServiceOfComment(%q) = %q, want %q", comment, got, want)
		}
	}
}
