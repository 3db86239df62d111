package harness

import (
	"context"
	"fmt"
	"strings"
)

// NFT runs `nft args...` inside the namespace and returns its combined output.
func (n *NetNS) NFT(ctx context.Context, args ...string) (string, error) {
	return n.Run(ctx, append([]string{"nft"}, args...)...)
}

// NFTTables lists the namespace's nftables tables as "family name" ("ip kube-proxy", "inet other"), in
// the order nft lists them.
func (n *NetNS) NFTTables(ctx context.Context) ([]string, error) {
	out, err := n.NFT(ctx, "list", "tables")
	if err != nil {
		return nil, err
	}
	var tables []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "table" {
			tables = append(tables, f[1]+" "+f[2])
		}
	}
	return tables, nil
}

// NFTListTable returns `nft list table family name` inside the namespace, parsed; nil (and no error)
// when the table does not exist.
func (n *NetNS) NFTListTable(ctx context.Context, family, name string) (*NFTTable, string, error) {
	tables, err := n.NFTTables(ctx)
	if err != nil {
		return nil, "", err
	}
	found := false
	for _, t := range tables {
		found = found || t == family+" "+name
	}
	if !found {
		return nil, "", nil
	}
	out, err := n.NFT(ctx, "list", "table", family, name)
	if err != nil {
		// Deleted between the two commands.
		if strings.Contains(out, "No such file or directory") {
			return nil, "", nil
		}
		return nil, out, err
	}
	parsed, err := ParseNFT(out)
	if err != nil {
		return nil, out, err
	}
	if len(parsed) != 1 {
		return nil, out, fmt.Errorf("nft list table %s %s: %d tables in the output", family, name, len(parsed))
	}
	return parsed[0], out, nil
}
