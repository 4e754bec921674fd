package store

import (
	"context"
	"testing"
	"time"
)

func TestCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	begin := time.Now()
	c, err := StartCluster(ctx, 3, testLogger(t))
	if err != nil {
		t.Fatalf("StartCluster: %v", err)
	}
	t.Logf("StartCluster(3) took %v", time.Since(begin))
	defer func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	eps := c.Endpoints()
	if len(eps) != 3 {
		t.Fatalf("Endpoints() = %v, want 3", eps)
	}

	cli := dial(t, ClientConfig{Endpoints: eps})
	members, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(members.Members) != 3 {
		t.Fatalf("%d members, want 3", len(members.Members))
	}
	// Members use etcd's default ticks (100 ms, election 1 s), under which
	// etcd raises lease TTLs below 2 s to 2 s.
	lease, err := cli.Grant(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if lease.TTL != 2 {
		t.Errorf("Grant(1).TTL = %d, want 2", lease.TTL)
	}

	kv := NewKV(NewClient(cli), "/cluster/")
	if err := kv.Set(ctx, "before", []byte("1")); err != nil {
		t.Fatalf("Set: %v", err)
	}

	// Stop the leader, the hardest member to lose: the rest must elect a
	// new one and carry on.
	leader := -1
	for i, ep := range eps {
		st, err := cli.Status(ctx, "http://"+ep)
		if err != nil {
			t.Fatal(err)
		}
		if st.Leader == st.Header.MemberId {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatal("no leader")
	}
	// A Get waiting across the failover must still see the Set.
	got := make(chan []byte, 1)
	go func() {
		v, _ := kv.Get(ctx, "after")
		got <- v
	}()
	begin = time.Now()
	if err := c.Stop(leader); err != nil {
		t.Fatalf("Stop(%d): %v", leader, err)
	}
	t.Logf("Stop(leader) took %v", time.Since(begin))
	if err := c.Stop(leader); err != nil {
		t.Fatalf("second Stop(%d): %v", leader, err)
	}

	begin = time.Now()
	if err := kv.Set(ctx, "after", []byte("2")); err != nil {
		t.Fatalf("Set after stopping a member: %v", err)
	}
	t.Logf("first Set after losing the leader took %v", time.Since(begin))
	select {
	case v := <-got:
		if string(v) != "2" {
			t.Fatalf("Get = %q, want 2", v)
		}
	case <-ctx.Done():
		t.Fatal("Get did not see the Set made after failover")
	}
	if v, err := kv.Get(ctx, "before"); err != nil || string(v) != "1" {
		t.Fatalf("Get before = %q, %v", v, err)
	}

	// A fresh Dial with all three endpoints still works.
	cli2 := dial(t, ClientConfig{Endpoints: eps, DialTimeout: 5 * time.Second})
	if _, err := cli2.Put(ctx, "fresh", "3"); err != nil {
		t.Fatalf("Put through a new client: %v", err)
	}
}
